"""The Qt binding itself: PySide6 6.12.0 drops one reference to None on every Qt call that returns nothing, and on
Python 3.11 (where None is not immortal) the app aborts with "deallocating None" after a few minutes of streaming.
pyproject pins a release without the leak; this test fails on one that has it."""
import sys

from PySide6.QtWidgets import QLabel


def test_void_qt_calls_keep_the_reference_count_of_none(qapp):
    label = QLabel()
    before = sys.getrefcount(None)
    for i in range(2000):
        label.setText(str(i))
        label.setToolTip("")
    assert abs(sys.getrefcount(None) - before) < 100
