"""The shared base every stage imports: errors, units, paths, specs, the user-facing choices, the training
setup, atomic writes, the seed case."""
