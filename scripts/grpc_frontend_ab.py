"""A/B of the gRPC transports: `python scripts/grpc_frontend_ab.py grpcio|native` starts
shmserve (examples/model_repository, one frontend) with that --grpc-frontend, runs
scripts/bench (grpc, identity_fp32 [1,16], c=16, 5 s; NOBENCH=1 skips it), then h2load at
16 connections x 4 streams for 5 s and prints the frontend CPU us per request."""
import os, re, subprocess, sys, time, struct, tempfile, socket
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT_DIR); sys.path.insert(0, ROOT_DIR)
import numpy as np
from tests.e2e.harness import ServerProcess
ROOT = os.getcwd()
REPO = os.path.join(ROOT, "examples/model_repository")
def grpc_body():
    import tritonclient.grpc as g
    from tritonclient.grpc import service_pb2
    r = service_pb2.ModelInferRequest(model_name="identity_fp32")
    t = r.inputs.add(); t.name="INPUT0"; t.datatype="FP32"; t.shape.extend([1,16])
    r.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    m = r.SerializeToString()
    p = os.path.join(tempfile.gettempdir(), "ab_grpc.bin"); open(p,"wb").write(struct.pack(">BI",0,len(m))+m); return p
def cpu_of(pids):
    t = 0
    for p in pids:
        f = open(f"/proc/{p}/stat").read().rsplit(")",1)[1].split()
        t += int(f[11]) + int(f[12])
    return t / os.sysconf("SC_CLK_TCK")
def frontends():
    out = subprocess.run(["pgrep","-f",f"frontend.main.*--grpc-port {srv.grpc_port} "],capture_output=True,text=True).stdout
    return [int(x) for x in out.split()]
body = grpc_body()
mode = sys.argv[1]
srv = ServerProcess(REPO, "--grpc-frontend", mode, frontends=1).start()
try:
    fe = frontends()
    b = subprocess.run(["true"] if os.environ.get("NOBENCH") else ["scripts/bench","--url",srv.grpc_url,"--protocol","grpc","--model","identity_fp32","--shape","1,16","--concurrency","16","--duration","5"],capture_output=True,text=True)
    lines = [l for l in (b.stdout+b.stderr).splitlines() if l.strip()]
    print(mode, "BENCH:", *lines[-12:], sep="\n  ")
    cmd = ["h2load","-D","5","-c","16","-m","4","-t","1","-d",body,"-H","content-type: application/grpc","-H","te: trailers", f"http://{srv.grpc_url}/inference.GRPCInferenceService/ModelInfer"]
    subprocess.run(cmd[:2]+["2"]+cmd[3:],capture_output=True)
    c0 = cpu_of(fe); out = subprocess.run(cmd,capture_output=True,text=True).stdout; c1 = cpu_of(fe)
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out)
    n = int(m.group(1))
    print(mode, f"H2LOAD 64 streams: {n/5:.0f} req/s, failed {m.group(2)}, frontend CPU {1e6*(c1-c0)/n:.1f} us/req")
finally:
    srv.stop()
