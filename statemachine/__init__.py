"""Pure state machines and assignors: no I/O, no clock (time is an argument), no trio."""
