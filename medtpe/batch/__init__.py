"""The population batch job (`medtpe predict`) and its inputs."""
