from marssim.cli import console

console()
