"""Print the requirements of hloserve and one or more extras from pyproject.toml, one a line.

The Dockerfiles' build stages install these before copying the source, so the dependency
layer is cached across source edits:  ``python3.11 containers/requirements.py serve``.
"""

import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
lines = list(project.get("dependencies", []))
for extra in sys.argv[1:]:
    lines += project["optional-dependencies"][extra]
print("\n".join(lines))
