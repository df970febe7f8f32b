"""Runs a Python helper that prints a long report, waiting for it to exit before reading the
report: the report fills the pipe, and each waits for the other."""
import subprocess
import sys

HELPER = "for i in range(20000): print(f'row {i}: ok')"

proc = subprocess.Popen([sys.executable, "-c", HELPER], stdout=subprocess.PIPE)
code = proc.wait()
report = proc.stdout.read().decode()
print(code, len(report.splitlines()), "rows")
