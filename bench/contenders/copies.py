"""N copies of one command, which share their work through their consumer group: the plain loop in
as many processes as the job has cores (peer 2b, the fair ceiling for the same cores), and the
detector service in two instances. SIGTERM/SIGINT reach every copy.
Usage: copies.py N COMMAND [ARGS...]
"""

import signal
import subprocess
import sys


def main(count, *command):
    copies = [subprocess.Popen(list(command)) for _ in range(int(count))]

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
