"""The infrastructure the top-level modules stand on (it never imports them, nor scripts/): flags,
the embedded world and dataset loaders, generation engines, the warm start's model and fitting, a
run's directory (what it may do to it, files written whole or not at all) and the training loop's
bookkeeping, the policy's weights over processes, search indexes and the HTTP server, the agent's
protocol (settings, prompt texts, parsing), a rollout batch's health metrics, drawing."""
