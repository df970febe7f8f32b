"""Checking recorded events against a template, for tests (after trio's check_sequence_matches).

A template is a list; each entry is one expected item, or a *set* of items that must appear next,
in any order (processes and threads race, so their events interleave differently each run)::

    check_sequence_matches(
        [e.kind for e in trace.events if e.pid == child],
        ["process.start", "process.bootstrap", {"mark", "queue.put"}, "process.exit"])
"""


def check_sequence_matches(seq, template):
    """Raise AssertionError (saying where) unless `seq` matches `template` exactly."""
    seq = list(seq)
    i = 0
    for n, expected in enumerate(template):
        group = expected if isinstance(expected, (set, frozenset)) else {expected}
        got = seq[i:i + len(group)]
        if sorted(map(repr, got)) != sorted(map(repr, group)):
            raise AssertionError(
                f"template entry {n} expects {_show(expected)} at position {i}, but the sequence "
                f"has {got!r} there\nwhole sequence: {seq!r}")
        i += len(group)
    if i != len(seq):
        raise AssertionError(f"{len(seq) - i} unexpected items after the template: "
                             f"{seq[i:]!r}\nwhole sequence: {seq!r}")


def _show(expected):
    if isinstance(expected, (set, frozenset)):
        return "{" + ", ".join(sorted(map(repr, expected))) + "} (any order)"
    return repr(expected)
