"""The papers' figures, one module per figure, each drawn from measured data (never re-typed numbers)
into a PNG with the plotted data beside it as CSV."""
