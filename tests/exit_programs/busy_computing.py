"""Count for a minute: busy, waiting for nothing -- the learner presses Ctrl-C to ask where it is.

The report must say the main thread runs (uses CPU) at this line, and invent no wait.
"""
import time

print("counting", flush=True)
total, end = 0, time.monotonic() + 60
while time.monotonic() < end:
    total += 1
print(total)
