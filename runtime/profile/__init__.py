"""`mode=profile`: measures the runtime's own steps, operators and host work for costmodel=profiled.
Imports torch (through the model runner), except grid.py, plans.py and tables.py."""
