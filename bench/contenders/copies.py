"""Peer (2b): the plain loop in as many processes as the job has cores, one consumer group: the fair
ceiling for the same cores. SIGTERM/SIGINT reach every copy.
Usage: plain_loop_processes.py N BOOTSTRAP INPUT OUTPUT GROUP MODULE:DETECTOR
"""

import pathlib
import signal
import subprocess
import sys

LOOP = pathlib.Path(__file__).with_name("plain_loop.py")


def main(count, *args):
    copies = [subprocess.Popen([sys.executable, str(LOOP), *args]) for _ in range(int(count))]

    def forward(signum, _frame):
        for p in copies:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in copies]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
