"""Write a report in the background while the main program goes on."""
import sys
import time
from multiprocessing import Process


def write_report(path):
    time.sleep(1.0)                 # gather the figures
    with open(path, "w") as f:
        f.write("all figures\n")


if __name__ == "__main__":
    Process(target=write_report, args=(sys.argv[1],), daemon=True).start()
    print("collected the figures; the report is being written")
