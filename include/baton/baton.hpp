#pragma once
/// \file baton.hpp
/// Everything of baton's public API.

#include "baton/algorithms.hpp"
#include "baton/callbacks.hpp"
#include "baton/checkpoint.hpp"
#include "baton/data.hpp"
#include "baton/distributed.hpp"
#include "baton/error.hpp"
#include "baton/events.hpp"
#include "baton/eval.hpp"
#include "baton/fit.hpp"
#include "baton/hparams.hpp"
#include "baton/loss.hpp"
#include "baton/model.hpp"
#include "baton/optim.hpp"
#include "baton/params.hpp"
#include "baton/runtime.hpp"
#include "baton/schedule.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "baton/time.hpp"
