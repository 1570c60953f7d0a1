"""The infrastructure the top-level modules stand on (it never imports them): flags, the embedded
world and dataset loaders, generation engines, the warm start, a run's bookkeeping and what it may
do to its directory, files written whole or not at all, search indexes and the HTTP server, the
agent's protocol (settings, prompt texts, parsing), a rollout batch's health metrics, drawing, and
the inspection command lines."""
