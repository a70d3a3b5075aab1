#!/usr/bin/env python3
"""`scripts/bench` and `import bench` from scripts/: the load generator now lives in
scheduler/bench/main.py, so that installing the package gives it as `shmserve-bench`.

Imported, this name becomes that very module (scripts/compare.py and the tests read its
internals); run, it runs its main.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scheduler.bench import main as _bench  # noqa: E402

if __name__ == "__main__":
    sys.exit(_bench.main())
sys.modules[__name__] = _bench
