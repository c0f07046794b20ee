#include "grammar/frontends.h"
