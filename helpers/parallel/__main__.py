"""``python -m helpers.parallel``: see ``helpers.parallel.cli``."""
from helpers.parallel.cli import main  # the importable module: ranks pickle its functions

main()
