#!/usr/bin/env python3
"""How many warm copies of N bytes per second this machine makes (numpy.copyto between
two pre-faulted buffers): the floor a server that copies a tensor once is measured
against.

    scripts/memcpy_rate.py 16777216 --seconds 3
"""

import argparse
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nbytes", type=int)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    src = np.ones(args.nbytes, dtype=np.uint8)
    dst = np.zeros(args.nbytes, dtype=np.uint8)
    np.copyto(dst, src)  # fault both in
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        np.copyto(dst, src)
        count += 1
    elapsed = time.perf_counter() - start
    rate = count / elapsed
    print(f"memcpy of {args.nbytes} bytes: {rate:.1f} copies/s, "
          f"{rate * args.nbytes / 1e9:.2f} GB/s, {1e3 / rate:.3f} ms each")


if __name__ == "__main__":
    main()
