import gc
import sys

from marssim.cli import main

code = main()
# the process ends here: what the run kept needs no last walk by the cyclic collector at exit
# (a full pass over the hundreds of thousands of objects a large run keeps; modules' finalisers
# and atexit handlers run as before)
gc.freeze()
sys.exit(code)
