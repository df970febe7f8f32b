"""Sorts words with the system's `sort`, waiting for it to finish before reading its output:
sort's output (about 300 KiB) fills the pipe, sort waits for a reader, the program waits for sort."""
import subprocess

words = ["pear", "apple", "fig"] * 20000
p = subprocess.Popen(["sort"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
p.stdin.write("\n".join(words))
p.stdin.close()
p.wait()                         # sort's output fills the pipe first
print(p.stdout.read().splitlines()[:3])
