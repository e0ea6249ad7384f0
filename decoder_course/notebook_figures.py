"""Where a kernel's matplotlib figures get their ``text/html`` form (an ``<img>`` with its description as ``alt``).

A leaf: both the package's ``__init__`` (a figure drawn with ``plt`` alone) and :mod:`decoder_course.plots` (a
kernel that imported the package before its shell existed) register here, so neither imports the other for it.
"""

import sys
from collections.abc import Callable


def register(render: Callable) -> bool:
    """Show every matplotlib figure of this kernel through ``render(fig) -> {mime: data}`` too: IPython's
    mime-bundle formatter, which the inline backend leaves alone (it removes every per-type formatter of ``Figure``
    whenever it sets its formats, as on pyplot's import). Registered by name, so matplotlib is not imported here.
    True when registered; False outside a kernel's shell."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    formatter = getattr(getattr(shell, "display_formatter", None), "mimebundle_formatter", None)
    if formatter is None:
        return False
    formatter.for_type_by_name("matplotlib.figure", "Figure", render)
    return True
