class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("err_broken never loads")

    def execute(self, requests):
        raise RuntimeError("unreachable")
