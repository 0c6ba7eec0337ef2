"""Print the README's Quick start commands, one per line: the fenced blocks under the
'## Quick start' heading, each holding one command."""
import re
import sys

text = open(sys.argv[1]).read()
section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
    print(" ".join(block.split()))
