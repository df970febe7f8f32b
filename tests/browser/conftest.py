# fixture.ipynb is the browser suite's stand-in notebook (tests/test_browser.py opens it in
# JupyterLab), not a lesson: keep nbval (--nbval-lax collects every .ipynb) from running it too.
collect_ignore = ["fixture.ipynb"]
