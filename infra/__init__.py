"""The infrastructure the top-level modules stand on (it never imports them); so far, drawing."""
