"""The programs that drive the top level: the command lines of eval.py, advantages.py and the
rollout dump, and the warm start's driver. They may import the top-level modules (infra/ never
does); none is imported by a module it imports, so no import circle passes through them.
"""
