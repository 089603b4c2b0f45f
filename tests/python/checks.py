"""What the Python module's test scripts share (tests/python/*.py import it from their own
directory, which Python puts first on sys.path)."""

import ringrec


def raises(kind, words, f):
    """Runs f, which must raise `kind` with every one of `words` in its message."""
    r = ringrec.rank()
    try:
        f()
    except kind as e:
        assert all(w in str(e) for w in words), "rank %d: %s lacks %s" % (r, e, words)
        return
    raise AssertionError("rank %d: no %s naming %s" % (r, kind.__name__, words))
