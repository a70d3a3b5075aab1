"""`import triton_python_backend_utils as pb_utils`, as Triton python-backend models do.

The API lives in workers.python_backend.pb_utils. The star import shows its public names
to IDEs and linters; then this name is made to be that very module, so hooks the worker
sets on it (and isinstance checks) hold whichever name a model imports.
"""

import sys

from workers.python_backend import pb_utils as _pb_utils
from workers.python_backend.pb_utils import *  # noqa: F401,F403
from workers.python_backend.pb_utils import __all__  # noqa: F401

sys.modules[__name__] = _pb_utils
