"""The frames that stand for what a stack walk could not name, as a recording keeps them.

The symbolizer and the Python frame walk (collector/binaries/) write them into
the recorded stacks; flame graphs and the report read them back to tell a cut
stack from a whole one, without the binaries stage that wrote them.
"""

TRUNCATED = "[truncated]"  # a native walk cut short at the kernel's depth limit
NATIVE_GAP = "[native frames not walked]"  # between the Python frames and the native ones below them
UNREADABLE = "py::[code object not readable]"
PYTHON_LOST = "[lost: Python stack not kept]"
