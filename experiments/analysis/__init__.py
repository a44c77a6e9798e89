"""A run directory into numbers and pictures: records, metrics with their intervals, summaries, plots.

Reads only the run directory (experiments.rundir) and the spec's shared words (experiments.spec);
never imports the run floor (experiments.run), so any run can be analysed again at any time.
"""
