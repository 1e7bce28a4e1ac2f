"""The old home of :mod:`hloserve.names` (the names every layer shares): the same module object.

``import hloserve.model_repository_tools.names`` keeps working for code written before the
names moved to the bottom of the package.
"""

import sys

from hloserve import names

sys.modules[__name__] = names
