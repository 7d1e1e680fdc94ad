//! The mount's actors: `FuseSupervisor` owns a `FuseSession`, which owns
//! the fuser session (the kernel connection and its threads).
//!
//! - The session mounts in `pre_start` and unmounts in `post_stop`.
//! - When the kernel ends the session (an unmount from outside), the
//!   session stops normally and the supervisor stops with it: the process
//!   exits cleanly.
//! - When the session fails, the supervisor aborts the kernel connection
//!   and detaches the mount point (so nothing hangs on it), logs what
//!   happened, and mounts again with backoff, up to the restart limit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use curvine_runtime::supervisor::{RestartPolicy, RestartTracker};

use crate::fs::{CurvineFs, Fs};
use crate::mountpoint;

static FATAL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Why the supervisor gave up, if it did.
pub fn fatal() -> Option<String> {
    FATAL.get().cloned()
}

/// Builds the file system state for a new session (a remount starts with
/// an empty inode table, as the kernel does).
pub type FsFactory = Arc<dyn Fn() -> Arc<Fs> + Send + Sync>;

#[derive(Clone)]
pub struct MountSpec {
    pub mountpoint: PathBuf,
    pub options: fuser::Config,
    pub make_fs: FsFactory,
    /// Readahead to ask of the kernel for the mount (bytes).
    pub read_ahead: u64,
}

pub enum SessionMsg {
    /// The fuser session returned (`None`: the kernel ended it normally).
    Ended(Option<String>),
}

impl ractor::Message for SessionMsg {}

pub struct FuseSession;

pub struct SessionState {
    unmounter: Option<fuser::SessionUnmounter>,
    mountpoint: PathBuf,
}

impl Actor for FuseSession {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = MountSpec;

    async fn pre_start(
        &self,
        myself: ActorRef<SessionMsg>,
        spec: MountSpec,
    ) -> Result<SessionState, ActorProcessingErr> {
        let fs = (spec.make_fs)();
        let mnt = spec.mountpoint.clone();
        let options = spec.options.clone();
        let fs2 = fs.clone();
        let mut session = tokio::task::spawn_blocking(move || {
            fuser::Session::new(CurvineFs(fs2), &mnt, &options)
        })
        .await
        .map_err(|e| format!("mount task: {e}"))?
        .map_err(|e| format!("cannot mount on {}: {e}", spec.mountpoint.display()))?;
        let unmounter = session.unmount_callable();
        fs.set_notifier(session.notifier());
        let me = myself.clone();
        std::thread::Builder::new()
            .name("fuse-session".into())
            .spawn(move || {
                let result = session.run();
                let _ = me.cast(SessionMsg::Ended(result.err().map(|e| e.to_string())));
            })
            .map_err(|e| format!("cannot start the session thread: {e}"))?;
        if let Some(ra) = mountpoint::set_read_ahead(&spec.mountpoint, spec.read_ahead) {
            tracing::info!(read_ahead_kb = ra / 1024, "kernel readahead of the mount");
        }
        tracing::info!(mountpoint = %spec.mountpoint.display(), "mounted");
        Ok(SessionState {
            unmounter: Some(unmounter),
            mountpoint: spec.mountpoint,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SessionMsg>,
        message: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SessionMsg::Ended(None) => {
                tracing::info!(mountpoint = %state.mountpoint.display(), "unmounted");
                state.unmounter = None;
                myself.stop(Some("unmounted".into()));
                Ok(())
            }
            SessionMsg::Ended(Some(e)) => Err(format!("the FUSE session ended: {e}").into()),
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SessionMsg>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(mut u) = state.unmounter.take() {
            if let Err(e) = u.unmount() {
                tracing::warn!(error = %e, "unmount failed; detaching the mount");
                if let Err(e) = mountpoint::unmount(&state.mountpoint, true) {
                    tracing::error!(error = %e, "cannot detach the mount");
                }
            }
        }
        Ok(())
    }
}

pub struct FuseSupervisor;

pub enum SupervisorMsg {
    Remount,
}

impl ractor::Message for SupervisorMsg {}

pub struct SupervisorState {
    spec: MountSpec,
    policy: RestartPolicy,
    tracker: RestartTracker,
    session: Option<ActorRef<SessionMsg>>,
}

impl FuseSupervisor {
    async fn start_session(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (session, _) =
            Actor::spawn_linked(None, FuseSession, state.spec.clone(), myself.get_cell())
                .await
                .map_err(|e| format!("{e}"))?;
        state.session = Some(session);
        Ok(())
    }
}

impl Actor for FuseSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = (MountSpec, RestartPolicy);

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        (spec, policy): (MountSpec, RestartPolicy),
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            spec,
            policy,
            tracker: RestartTracker::default(),
            session: None,
        };
        Self::start_session(&myself, &mut state).await?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Remount => {
                if let Err(e) = Self::start_session(&myself, state).await {
                    tracing::error!(error = %e, "remount failed");
                    self.on_failure(&myself, state, &e.to_string())?;
                } else {
                    tracing::warn!(mountpoint = %state.spec.mountpoint.display(), "mounted again after a failure");
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let ours = |id: ractor::ActorId| state.session.as_ref().is_some_and(|s| s.get_id() == id);
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) if ours(cell.get_id()) => {
                state.session = None;
                tracing::info!(
                    reason = reason.unwrap_or_default(),
                    "the FUSE session ended"
                );
                myself.stop(Some("unmounted".into()));
            }
            SupervisionEvent::ActorFailed(cell, error) if ours(cell.get_id()) => {
                state.session = None;
                let mnt = &state.spec.mountpoint;
                match mountpoint::clear(mnt) {
                    Ok(done) => tracing::error!(
                        error = %error,
                        cleanup = done,
                        "the FUSE session failed; nothing waits on the mount point"
                    ),
                    Err(e) => tracing::error!(
                        error = %error,
                        cleanup_error = e,
                        "the FUSE session failed and its mount could not be detached"
                    ),
                }
                self.on_failure(&myself, state, &error.to_string())?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<SupervisorMsg>,
        _state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        myself
            .stop_children_and_wait(None, Some(std::time::Duration::from_secs(30)))
            .await;
        Ok(())
    }
}

impl FuseSupervisor {
    fn on_failure(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        error: &str,
    ) -> Result<(), ActorProcessingErr> {
        match state.tracker.on_failure(&state.policy, Instant::now()) {
            Some(delay) => {
                tracing::warn!(delay_ms = delay.as_millis() as u64, "mounting again");
                myself.send_after(delay, || SupervisorMsg::Remount);
                Ok(())
            }
            None => {
                let e = format!(
                    "the FUSE session failed {} times within {:?}; last error: {error}",
                    state.policy.max_restarts, state.policy.window
                );
                let _ = FATAL.set(e.clone());
                Err(e.into())
            }
        }
    }
}
