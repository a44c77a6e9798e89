"""What a run is asked to do: the experiment spec, its workload, deployment, placement, faults and cross traffic.

Pure descriptions and their validation (nothing starts here); the run and the analysis floors both read
them. Imports only the run directory's formats (experiments.rundir) of experiments/.
"""
