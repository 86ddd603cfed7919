"""The machine a job runs on: backends and what each can run, devices and their peak figures, several processes or GPUs, and Lightning's private state read in one place."""
