"""``python -m fa_variants``: the ``fa-variants`` command (``fa_variants.cli``)."""
import sys

from fa_variants.cli import entry

sys.exit(entry())
