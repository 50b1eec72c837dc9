"""The exercises' checkers: answers checked in the kernel, a learner's code run on real gloo processes."""
