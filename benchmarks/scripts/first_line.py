import time; open("first_line.json", "w").write(repr(time.time()))  # noqa: E702 - the first line
