/* See modcache.h. Worker thread only. */
#include "modcache.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/clock.h"
#include "graphd/status.h"
#include "common/log.h"

_Static_assert(GD_FUNC_MAX_PARAMS >= GD_MAX_PARAMS, "a function can describe every parameter");

typedef struct dev_module {
  void *mod;
  int state; /* 0 not loaded, 1 loaded, -1 failed */
  int fail_code;
  char *fail_msg; /* the load error, kept so we do not re-JIT on every call */
} dev_module;

typedef struct dev_prog {
  bool prepared;
  const gd_regprog *prog;
  uint32_t nsteps;
  gd_dev_func **step_func; /* per step, launch steps only */
} dev_prog;

struct gd_modcache {
  dev_module *mods;
  uint32_t nmods;
  dev_prog *progs;
  uint32_t nprogs;
};

static int grow(void **arr, uint32_t *n, uint32_t want, size_t elem) {
  if (want <= *n) return 0;
  uint32_t cap = *n ? *n : 16;
  while (cap < want) cap *= 2;
  void *p = realloc(*arr, (size_t)cap * elem);
  if (!p) return -1;
  memset((char *)p + (size_t)*n * elem, 0, (size_t)(cap - *n) * elem);
  *arr = p;
  *n = cap;
  return 0;
}

static struct gd_modcache *state_of(gd_device *d) {
  if (!d->mods) d->mods = calloc(1, sizeof *d->mods);
  return d->mods;
}

static int load_module(gd_device *d, struct gd_modcache *ds, const gd_module *m, uint64_t *loaded,
                       uint64_t *load_ns, char *err, size_t errlen) {
  if (grow((void **)&ds->mods, &ds->nmods, m->index + 1, sizeof *ds->mods) < 0) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  dev_module *dm = &ds->mods[m->index];
  if (dm->state == 1) return 0;
  if (dm->state == -1) {
    snprintf(err, errlen, "%s", dm->fail_msg ? dm->fail_msg : "the module failed to load");
    return dm->fail_code;
  }
  char hex[2 * GD_ID_LEN + 1];
  gd_id_hex(m->id, 1, hex);
  uint64_t t0 = gd_now_ns();
  char msg[8192];
  msg[0] = '\0';
  int rc =
      d->be->ops->module_load(d->be, d->dev, m->kind, m->bytes, m->len, &dm->mod, msg, sizeof msg);
  uint64_t dt = gd_now_ns() - t0;
  if (rc < 0) {
    dm->state = -1;
    dm->fail_code = rc;
    size_t n = strlen(msg) + 64;
    dm->fail_msg = malloc(n);
    if (dm->fail_msg) snprintf(dm->fail_msg, n, "module %s: %s", hex, msg);
    snprintf(err, errlen, "module %s: %s", hex, msg);
    GD_LOG(GD_WARN, "prepare", "module %s failed to load: %s", hex, msg);
    return rc;
  }
  dm->state = 1;
  (*loaded)++;
  *load_ns += dt;
  GD_LOG(GD_INFO, "prepare", "module %s (%zu bytes) loaded in %.1f ms", hex, m->len,
         (double)dt / 1e6);
  return 0;
}

/* Compares one launch with its function (the device stage proper). */
static int check_launch(gd_device *d, uint32_t i, const gd_launch *l, gd_dev_func *f, char *err,
                        size_t errlen) {
  const gd_func_info *fi = &f->info;
  if (fi->params_known) {
    if (fi->nparams != l->nparams) {
      snprintf(err, errlen,
               "step %u (launch %s): the program passes %u parameters but the kernel takes %u", i,
               l->name, l->nparams, fi->nparams);
      return -GRAPHD_INVALID_ARGUMENT;
    }
    for (uint32_t k = 0; k < l->nparams; k++) {
      if (fi->param_offset[k] != l->params[k].offset || fi->param_size[k] != l->params[k].size) {
        snprintf(err, errlen,
                 "step %u (launch %s): parameter %u is %u bytes at offset %u, but the kernel's "
                 "parameter %u is %u bytes at offset %u",
                 i, l->name, k, l->params[k].size, l->params[k].offset, k, fi->param_size[k],
                 fi->param_offset[k]);
        return -GRAPHD_INVALID_ARGUMENT;
      }
    }
  }
  uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
  if (fi->max_threads_per_block && threads > fi->max_threads_per_block) {
    snprintf(err, errlen,
             "step %u (launch %s): a block of %llu threads is over the kernel's limit of %u on "
             "this device",
             i, l->name, (unsigned long long)threads, fi->max_threads_per_block);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  uint64_t shared = (uint64_t)fi->static_shared_bytes + l->shared_bytes;
  if (shared > fi->max_shared_optin) {
    snprintf(err, errlen,
             "step %u (launch %s): needs %llu bytes of shared memory (%u static + %u dynamic); the "
             "device allows %u per block",
             i, l->name, (unsigned long long)shared, fi->static_shared_bytes, l->shared_bytes,
             fi->max_shared_optin);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (l->shared_bytes > fi->default_shared_limit && l->shared_bytes > f->shared_opted_in) {
    char e[256];
    int rc = d->be->ops->function_set_shared(d->be, d->dev, f->fn, l->shared_bytes, e, sizeof e);
    if (rc < 0) {
      snprintf(err, errlen,
               "step %u (launch %s): cannot allow %u bytes of dynamic shared memory: %s", i,
               l->name, l->shared_bytes, e);
      return rc;
    }
    f->shared_opted_in = l->shared_bytes;
  }
  return 0;
}

int modcache_prepare(gd_device *d, const gd_regprog *p, uint64_t *loaded, uint64_t *load_ns,
                     char *err, size_t errlen) {
  struct gd_modcache *ds = state_of(d);
  *loaded = 0;
  *load_ns = 0;
  if (!ds || grow((void **)&ds->progs, &ds->nprogs, p->index + 1, sizeof *ds->progs) < 0) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  dev_prog *dp = &ds->progs[p->index];
  if (dp->prepared) return 0;
  const gd_program *prog = p->program;
  if (!dp->step_func) {
    if (!(dp->step_func = calloc(prog->nsteps, sizeof *dp->step_func))) {
      snprintf(err, errlen, "out of memory");
      return -GRAPHD_RESOURCE_EXHAUSTED;
    }
    dp->nsteps = prog->nsteps;
    dp->prog = p;
  }
  for (uint32_t i = 0; i < prog->nsteps; i++) {
    if (prog->steps[i].kind != GD_STEP_LAUNCH) continue;
    const gd_launch *l = &prog->steps[i].u.launch;
    const gd_module *m = p->step_module[i];
    int rc = load_module(d, ds, m, loaded, load_ns, err, errlen);
    if (rc < 0) {
      char e[1024];
      snprintf(e, sizeof e, "%s", err);
      snprintf(err, errlen, "step %u (launch %s): %s", i, l->name, e);
      return rc;
    }
    if (!dp->step_func[i]) {
      gd_dev_func *f = calloc(1, sizeof *f);
      if (!f) {
        snprintf(err, errlen, "out of memory");
        return -GRAPHD_RESOURCE_EXHAUSTED;
      }
      char e[512];
      rc = d->be->ops->function_get(d->be, d->dev, ds->mods[m->index].mod, l->name, &f->fn,
                                    &f->info, e, sizeof e);
      if (rc < 0) {
        free(f);
        snprintf(err, errlen, "step %u (launch %s): %s", i, l->name, e);
        return rc;
      }
      dp->step_func[i] = f;
    }
    rc = check_launch(d, i, l, dp->step_func[i], err, errlen);
    if (rc < 0) return rc;
  }
  dp->prepared = true;
  return 0;
}

gd_dev_func *modcache_function(gd_device *d, const gd_regprog *p, uint32_t step) {
  struct gd_modcache *ds = d->mods;
  if (!ds || p->index >= ds->nprogs || !ds->progs[p->index].step_func) return NULL;
  return ds->progs[p->index].step_func[step];
}

void modcache_release_module(gd_device *d, const gd_module *m) {
  struct gd_modcache *ds = d->mods;
  if (!ds || m->index >= ds->nmods || ds->mods[m->index].state != 1) return;
  /* Programs prepared against it hold its functions: they prepare again. */
  for (uint32_t i = 0; i < ds->nprogs; i++) {
    dev_prog *dp = &ds->progs[i];
    if (!dp->prog) continue;
    bool uses = false;
    for (uint32_t k = 0; k < dp->nsteps && !uses; k++) uses = dp->prog->step_module[k] == m;
    if (!uses) continue;
    for (uint32_t k = 0; k < dp->nsteps; k++) {
      free(dp->step_func[k]);
      dp->step_func[k] = NULL;
    }
    dp->prepared = false;
  }
  d->be->ops->module_unload(d->be, d->dev, ds->mods[m->index].mod);
  ds->mods[m->index].state = 0;
  ds->mods[m->index].mod = NULL;
}

void modcache_forget_program(gd_device *d, const gd_regprog *p) {
  struct gd_modcache *ds = d->mods;
  if (!ds || p->index >= ds->nprogs) return;
  dev_prog *dp = &ds->progs[p->index];
  for (uint32_t k = 0; dp->step_func && k < dp->nsteps; k++) free(dp->step_func[k]);
  free(dp->step_func);
  memset(dp, 0, sizeof *dp);
}

void modcache_forget_module(gd_device *d, const gd_module *m) {
  struct gd_modcache *ds = d->mods;
  if (!ds || m->index >= ds->nmods) return;
  modcache_release_module(d, m);
  free(ds->mods[m->index].fail_msg);
  memset(&ds->mods[m->index], 0, sizeof ds->mods[m->index]);
}

void modcache_close(gd_device *d) {
  struct gd_modcache *ds = d->mods;
  if (!ds) return;
  for (uint32_t i = 0; i < ds->nprogs; i++) {
    dev_prog *dp = &ds->progs[i];
    for (uint32_t k = 0; dp->step_func && k < dp->nsteps; k++) free(dp->step_func[k]);
    free(dp->step_func);
  }
  for (uint32_t i = 0; i < ds->nmods; i++) {
    if (ds->mods[i].state == 1) d->be->ops->module_unload(d->be, d->dev, ds->mods[i].mod);
    free(ds->mods[i].fail_msg);
  }
  free(ds->progs);
  free(ds->mods);
  free(ds);
  d->mods = NULL;
}
