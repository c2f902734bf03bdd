"""The demo's training with one rank made a straggler, as a slow data loader would make it.

python demo_straggler.py RANK SECONDS [demo train arguments]: rank RANK sleeps SECONDS
before each forward pass; everything else is `python -m prism_rr.demo.train`.
"""

import os
import sys
import time

from prism_rr.demo import train
from prism_rr.demo.model import GPT

slow, seconds = int(sys.argv[1]), float(sys.argv[2])
if int(os.environ["RANK"]) == slow:
    forward = GPT.forward

    def late_forward(self, *args, **kwargs):
        time.sleep(seconds)
        return forward(self, *args, **kwargs)

    GPT.forward = late_forward  # before the model is built: FSDP's subclass inherits it
train.main(sys.argv[3:])
