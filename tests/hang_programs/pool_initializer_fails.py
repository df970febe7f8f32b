"""Each Pool worker opens the database in its initializer (CPython gh-87472's shape); the path
is wrong, so every worker dies as it starts and the Pool starts a new one, for ever (the
initializer's error is printed again and again); map() never returns."""
import sqlite3
from multiprocessing import Pool

DB = "/nonexistent/dir/data.db"
conn = None


def open_db():
    global conn
    conn = sqlite3.connect(DB)


def count(table):
    return conn.execute(f"select count(*) from {table}").fetchone()[0]


if __name__ == "__main__":
    with Pool(2, initializer=open_db) as pool:
        print(pool.map(count, ["users", "orders"]))
