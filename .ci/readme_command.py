"""Print the README's Nth "two commands" command (the bash blocks under '## Two commands')."""

import re
import sys
from pathlib import Path

text = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()
section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
section = section.split("### ", 1)[0]
commands = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
if len(commands) != 2:
    sys.exit(f"expected 2 bash blocks under '## Two commands', found {len(commands)}")
print(commands[int(sys.argv[1]) - 1].strip())
