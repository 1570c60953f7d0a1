"""The infrastructure the top-level modules stand on (it never imports them, nor scripts/): flags,
the embedded world and dataset loaders, generation engines, the warm start's model and fitting, a
run's directory and the training loop's bookkeeping, search indexes and the HTTP server, the
agent's protocol (settings, prompt texts, parsing), a rollout batch's health metrics, drawing."""
