/* placeholder until the NVML part lands */
#include "simstate.h"
