"""Print each package whose installed version (``pip freeze`` on stdin) differs from the lock."""

import re
import sys

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


def pins(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        match = PIN.match(line)
        if match:
            found[match[1].lower().replace("_", "-")] = match[2]
    return found


with open(sys.argv[1]) as lock:
    locked = pins(lock.read().splitlines())
installed = pins(sys.stdin.read().splitlines())
for name in sorted(installed):
    if locked.get(name) != installed[name]:
        print(f"{name}: {locked.get(name, '(not locked)')} -> {installed[name]}")
