"""The elastic job's decisions: pure functions and a state machine, no threads, sockets,
processes or clock reads. The driver's executor performs the actions they return."""
