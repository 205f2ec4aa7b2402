"""Stage 2: decode an out-of-memory message and its traceback the way an expert reads them -- figures as
intervals, the request, fragmentation, anomalies, tensor candidates, the phase, the torch release, the verdict."""
