"""The pictures of the README and docs/: each one shown exists, each PNG in docs/images has a
maker and is shown somewhere.

docs/images/make_images.py redraws the pictures from real runs; a PNG it does not know would be
drawn by nobody and drift from the code (students believe the pictures), and a picture the
README or a page of docs/ links but nobody made is a broken image. Cheap: nothing is run or
drawn here.
"""
import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES = os.path.join(ROOT, "docs", "images")


def _maker():
    spec = importlib.util.spec_from_file_location("make_images",
                                                  os.path.join(IMAGES, "make_images.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)      # defines functions only: nothing runs on import
    return module


def _pngs():
    return {f[:-4] for f in os.listdir(IMAGES) if f.endswith(".png")}


def _linked(markdown_path):
    """The local images a Markdown file shows: ![alt](path), relative to that file."""
    with open(markdown_path, encoding="utf-8") as f:
        text = f.read()
    folder = os.path.dirname(markdown_path)
    return [os.path.normpath(os.path.join(folder, p))
            for p in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text) if "://" not in p]


def test_every_png_has_a_maker():
    maker = _maker()
    known = set(maker.PICTURES) | set(maker.ELSEWHERE)
    orphans = sorted(_pngs() - known)
    assert not orphans, (f"docs/images has {orphans} that make_images.py does not make. Fix: add "
                         f"a function drawing it from a real run to PICTURES (or, if something "
                         f"else makes it, say what in ELSEWHERE), or delete the picture")
    gone = sorted(known - _pngs())
    assert not gone, (f"make_images.py lists {gone} but docs/images has no such PNG. Fix: run "
                      f"`PYTHONPATH=. python docs/images/make_images.py {' '.join(gone)}`")


def _documents():
    """README.md and every Markdown page in docs/."""
    return [os.path.join(ROOT, "README.md")] + [
        os.path.join(ROOT, "docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
        if f.endswith(".md")]


def test_every_linked_image_exists():
    missing = [(os.path.relpath(doc, ROOT), os.path.relpath(image, ROOT))
               for doc in _documents() for image in _linked(doc) if not os.path.isfile(image)]
    assert not missing, f"images linked but not there (document, image): {missing}"


def test_every_picture_is_shown_somewhere():
    """A picture nobody links is a picture nobody checks against its text. The README shows
    one; the others are shown in docs/ beside the text that explains them (docs/TRACE.md)."""
    linked = {os.path.basename(p)[:-4] for doc in _documents() for p in _linked(doc)}
    assert _pngs() <= linked, (f"not shown in README.md or docs/*.md: "
                               f"{sorted(_pngs() - linked)}")


def test_pictures_stay_small():
    big = {f"{n}.png": os.path.getsize(os.path.join(IMAGES, n + ".png")) // 1024
           for n in _pngs() if os.path.getsize(os.path.join(IMAGES, n + ".png")) > 300 * 1024}
    assert not big, (f"pictures over 300 KiB (KiB): {big}. Fix: draw them at ~100 dpi "
                     f"(make_images.DPI)")
