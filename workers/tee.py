"""Copy a job's output to its log and to the file its owner asked for (docs/job-control.md).

    python -S -m workers.tee PATH

Started by the runner (``workers.runner``) as the job's owner, with the job's output pipe as
standard input and the attempt's log as standard output: every byte goes to both. The file
is opened for appending, created 0600 when missing, never through a symbolic link; a file
that cannot be opened is said once in the log, and the log still gets everything.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else ""
    target = -1
    if path:
        try:
            target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            message = f"[cosched] cannot write the output to {path}: {exc.strerror}\n"
            os.write(1, message.encode(errors="replace"))
    while True:
        try:
            data = os.read(0, 65536)
        except InterruptedError:
            continue
        if not data:
            break
        for fd in (1, target):
            if fd < 0:
                continue
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except OSError:
                    if fd == target:  # a full disk in the owner's directory: keep the log
                        os.close(target)
                        target = -1
                    break
    if target >= 0:
        os.close(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
