"""A printer thread prints the lines taken from a queue.Queue; the main thread puts its lines
and ends -- without stopping the thread."""
import queue
import threading

lines = queue.Queue()


def printer():
    while True:
        print(lines.get())


threading.Thread(target=printer).start()
for i in range(3):
    lines.put(f"line {i}")
print("main done")
