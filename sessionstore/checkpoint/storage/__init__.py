"""Object storage and local directories: the filesystem, retries, conditional create, the first request, private dirs."""
