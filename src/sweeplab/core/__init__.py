"""What every layer shares: errors for users, atomic files, the console, the command-line edge, config binding, the channels between processes, signals, labels."""
