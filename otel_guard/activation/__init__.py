"""Starting the guard: ready-made wiring in one call, and the zero-code distro and configurator."""
