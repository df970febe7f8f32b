# Seed 003 (tutorial), "Sharing tensors". Changed: the import lines (`import mpviz as torch`, which
# the snippet forgot altogether) and the snippet's typos: it puts `a` on `q`, but names them `mat`
# and `queue` — as written it would raise NameError under torch too.
import mpviz as torch
import mpviz.multiprocessing as mp
import time

mat = torch.randn((200, 200))
print(mat.is_shared())

queue = mp.Queue()
queue.put(mat)
print(mat.is_shared())
