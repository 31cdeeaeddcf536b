"""What the Python test scripts (ui-test.py, manifest-test.py) count their
checks with: each check that holds is printed and counted; the first that does
not raises Failed, which ends the run."""


class Failed(Exception):
    """A check that did not hold."""


class Checks:
    """Counts what held; the first that does not ends the run."""

    def __init__(self):
        self.passed = 0

    def ok(self, what, holds, detail=""):
        if not holds:
            raise Failed(f"{what}{': ' + detail if detail else ''}")
        self.passed += 1
        print(f"  ok  {what}")

    def eq(self, what, got, expected):
        self.ok(what, got == expected, f"got {got!r}, expected {expected!r}")
