"""One training job: its plan and rules, the job record both fit loops share, the Lightning fit loop, backends and devices."""
