"""Helpers of the browser test suite (tests/test_browser.py): a JupyterLab server, a notebook page
driven in Debian's Chromium through Playwright, and the Live widget as the page shows it."""
